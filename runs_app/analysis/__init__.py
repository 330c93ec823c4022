"""The numbers and where they are read from and written to.

`stats/` is pure (no Django): the statistics and the comparison every page, report, export, the
API and the gates show. On the database: `rollup` (the maintained tallies), `load` (the SQL a
comparison and the gates read), `reports` (Markdown, JSON, JUnit, HTML), `exports` (the one
trial-row shape, CSV / JSON streams) and `coder_eval_run` (a run as coder-eval's run folder).
"""
