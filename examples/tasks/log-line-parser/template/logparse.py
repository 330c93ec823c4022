"""Parse our service log lines, e.g.

    2024-05-01T12:00:03Z ERROR [billing] Payment declined: card=4242 amount=12.50
"""

from dataclasses import dataclass
from datetime import datetime


@dataclass(frozen=True)
class LogRecord:
    timestamp: datetime  # timezone-aware, UTC
    level: str
    component: str
    message: str


def parse_line(line: str) -> LogRecord | None:
    """Parse one log line; return None when the line does not follow the format."""
    raise NotImplementedError


def count_by_level(lines) -> dict[str, int]:
    """Count the parsed records per level, skipping lines that do not parse."""
    raise NotImplementedError
