"""Sign-up payloads from the public API."""

import re
from dataclasses import dataclass

FIELDS = ("username", "email", "age", "newsletter")
USERNAME = re.compile(r"[A-Za-z0-9_]{3,20}")
EMAIL = re.compile(r"[^@\s]+@[^@\s.]+(\.[^@\s.]+)+")


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


def _required_str(data: dict, field: str) -> str:
    if field not in data:
        raise ValidationError(field, "required")
    if not isinstance(data[field], str):
        raise ValidationError(field, "must be a string")
    return data[field]


def parse_signup(data) -> Signup:
    """Build a Signup from an untrusted, already JSON-decoded payload."""
    if not isinstance(data, dict):
        raise ValidationError("payload", "must be an object")
    unknown = sorted(str(key) for key in data if key not in FIELDS)
    if unknown:
        raise ValidationError(unknown[0], "unknown field")

    username = _required_str(data, "username")
    if not USERNAME.fullmatch(username):
        raise ValidationError("username", "3-20 letters, digits or underscores")

    email = _required_str(data, "email").strip().lower()
    if not EMAIL.fullmatch(email):
        raise ValidationError("email", "not a valid address")

    if "age" not in data:
        raise ValidationError("age", "required")
    age = data["age"]
    # bool is a subclass of int, but True is not an age.
    if isinstance(age, bool) or not isinstance(age, int):
        raise ValidationError("age", "must be an integer")
    if not 13 <= age <= 120:
        raise ValidationError("age", "must be between 13 and 120")

    newsletter = data.get("newsletter", False)
    if not isinstance(newsletter, bool):
        raise ValidationError("newsletter", "must be true or false")

    return Signup(username.lower(), email, age, newsletter)
