"""A staticfiles finder that serves plotly.js from the installed plotly package.

The comparison page needs plotly.min.js offline (no CDN), and the Python package already ships
the matching build in plotly/package_data. This finder exposes that one file as
`plotly/plotly.min.js`, so the dev server, whitenoise and collectstatic all find it and it is
never copied into git. Listed in settings.STATICFILES_FINDERS.
"""

from importlib.util import find_spec
from pathlib import Path

from django.contrib.staticfiles.finders import BaseFinder
from django.core.files.storage import FileSystemStorage

PREFIX = "plotly"
FILENAME = "plotly.min.js"
STATIC_PATH = f"{PREFIX}/{FILENAME}"


def package_data() -> Path:
    spec = find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the plotly package is not installed (pip install -r requirements.txt)")
    return Path(spec.submodule_search_locations[0]) / "package_data"


class PlotlyFinder(BaseFinder):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.storage = FileSystemStorage(location=package_data())
        # collectstatic and whitenoise put a storage's files under its `prefix`.
        self.storage.prefix = PREFIX

    def check(self, **kwargs) -> list:
        return []

    # Like Django's own finders, still accept the `all` keyword deprecated in Django 5.2.
    def find(self, path: str, find_all: bool = False, **kwargs) -> str | list[str]:
        if path != STATIC_PATH:
            return []  # what Django's finders return for "not here", either way
        found = self.storage.path(FILENAME)
        return [found] if find_all or kwargs.get("all") else found

    def list(self, ignore_patterns):
        yield FILENAME, self.storage
