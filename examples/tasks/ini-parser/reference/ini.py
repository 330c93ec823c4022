"""A tiny INI reader for our deploy settings (the standard configparser is too lenient for us)."""


class IniError(ValueError):
    """A line that is not valid INI; the message starts with "line N:"."""


def parse_ini(text: str) -> dict[str, dict[str, str]]:
    """Parse INI text into {section: {key: value}} (format in the task description)."""
    result: dict[str, dict[str, str]] = {}
    section = None
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            name = line[1:-1].strip()
            if not name:
                raise IniError(f"line {lineno}: empty section name")
            section = result.setdefault(name, {})
            continue
        separators = [i for i in (line.find("="), line.find(":")) if i >= 0]
        if not separators:
            raise IniError(f"line {lineno}: expected 'key = value' or '[section]'")
        if section is None:
            raise IniError(f"line {lineno}: key outside of any section")
        cut = min(separators)
        key = line[:cut].strip().lower()
        if not key:
            raise IniError(f"line {lineno}: empty key")
        section[key] = line[cut + 1 :].strip()
    return result
