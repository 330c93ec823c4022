"""URL slugs for blog post titles."""


def slugify(text: str, max_length: int = 50) -> str:
    """Turn a post title into a URL slug (rules in the task description)."""
    raise NotImplementedError
