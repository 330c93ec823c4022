"""URL slugs for blog post titles."""

import re
import unicodedata


def slugify(text: str, max_length: int = 50) -> str:
    """Turn a post title into a URL slug (rules in the task description)."""
    # NFKD splits "é" into "e" + a combining accent; the ASCII encode drops the accent.
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    slug = re.sub(r"[^a-z0-9]+", "-", folded.lower()).strip("-")
    if len(slug) > max_length:
        cut = slug.rfind("-", 0, max_length + 1)
        slug = slug[:cut] if cut > 0 else slug[:max_length]
    return slug or "untitled"
