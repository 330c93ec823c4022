"""The numbers, in pure Python (no Django): what every page, report, export, the API and the gates
show.

`intervals` (closed forms), `inference` (clustered intervals and the sign-flip test),
`comparison` (the comparison's types), `compare` (one comparison of arms against a baseline,
over units), `notes` (its warnings), `planning` (detectable effects and sample sizes),
`simulation` (seeded designs for checking them), `tally` (the pass-rate rule), `gates` (judging
a run's facts) and `charts` (Plotly figure dicts).
"""
