"""The pages: the run list and run page (`runs`), its live updates (`stream`), trials (`trials`),
comparisons (`compare`), the experiment pages that show runs (`experiments`), the account page
(`account`); `presenters` turns rows into what the templates show; one `urls.py`."""
