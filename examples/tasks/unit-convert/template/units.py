"""Unit conversions for the recipe and logistics apps."""

# (from unit, to unit) -> function converting a value
CONVERTERS = {
    ("m", "cm"): lambda value: value * 100,
    ("cm", "m"): lambda value: value / 100,
}


def convert(value: float, src: str, dst: str) -> float:
    """Convert `value` from unit `src` to unit `dst`."""
    try:
        converter = CONVERTERS[(src, dst)]
    except KeyError:
        raise ValueError(f"unsupported conversion: {src} -> {dst}") from None
    return converter(value)
