"""Parse our service log lines, e.g.

    2024-05-01T12:00:03Z ERROR [billing] Payment declined: card=4242 amount=12.50
"""

import re
from collections import Counter
from dataclasses import dataclass
from datetime import datetime

LINE = re.compile(
    r"(?P<ts>\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z) "
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"\[(?P<component>[A-Za-z0-9_.-]+)\] "
    r"(?P<message>.*)"
)


@dataclass(frozen=True)
class LogRecord:
    timestamp: datetime  # timezone-aware, UTC
    level: str
    component: str
    message: str


def parse_line(line: str) -> LogRecord | None:
    """Parse one log line; return None when the line does not follow the format."""
    match = LINE.fullmatch(line.rstrip("\r\n"))
    if match is None:
        return None
    try:
        # Python 3.11 reads the trailing "Z" as UTC.
        timestamp = datetime.fromisoformat(match["ts"])
    except ValueError:  # e.g. month 13
        return None
    return LogRecord(timestamp, match["level"], match["component"], match["message"].rstrip())


def count_by_level(lines) -> dict[str, int]:
    """Count the parsed records per level, skipping lines that do not parse."""
    records = (parse_line(line) for line in lines)
    return dict(Counter(record.level for record in records if record is not None))
