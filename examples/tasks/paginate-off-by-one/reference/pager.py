"""Pagination helpers for the product listing API."""


def page_count(total_items, per_page):
    """Number of pages needed to show `total_items`, `per_page` at a time (0 items -> 0 pages)."""
    if per_page < 1:
        raise ValueError("per_page must be >= 1")
    return -(-total_items // per_page)


def paginate(items, page, per_page=10):
    """Return the items shown on page number `page`.

    Pages are numbered from 1. A page past the end is an empty list.
    """
    if page < 1 or per_page < 1:
        raise ValueError("page and per_page must be >= 1")
    start = (page - 1) * per_page
    return items[start : start + per_page]
