"""A tiny INI reader for our deploy settings (the standard configparser is too lenient for us)."""


class IniError(ValueError):
    """A line that is not valid INI; the message starts with "line N:"."""


def parse_ini(text: str) -> dict[str, dict[str, str]]:
    """Parse INI text into {section: {key: value}} (format in the task description)."""
    raise NotImplementedError
