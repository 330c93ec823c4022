"""The numbers: what every page, report, export, the API and the gates show.

Pure (no Django): `stats` (closed forms), `inference` (clustered intervals and the sign-flip
test), `compare` (one comparison of arms against a baseline, over units), `notes` (its warnings),
`planning` (detectable effects and sample sizes), `tally` (the pass-rate rule), `gates` (judging a run's
facts) and `charts` (Plotly figure dicts). On the database: `load` (the SQL a comparison and the
gates read), `reports` (Markdown, JSON, JUnit, HTML) and `exports` (the one trial-row shape,
CSV / JSON streams).
"""
