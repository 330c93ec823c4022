"""Sign-up payloads from the public API."""

from dataclasses import dataclass


class ValidationError(ValueError):
    """A rejected payload; `field` names the offending field."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Signup:
    username: str
    email: str
    age: int
    newsletter: bool = False


def parse_signup(data) -> Signup:
    """Build a Signup from an untrusted, already JSON-decoded payload."""
    return Signup(data["username"], data["email"], data["age"], data.get("newsletter", False))
