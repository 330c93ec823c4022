"""Unit conversions for the recipe and logistics apps."""

KM_PER_MILE = 1.609344
KG_PER_POUND = 0.45359237
LITRES_PER_US_GALLON = 3.785411784

# (from unit, to unit) -> function converting a value
CONVERTERS = {
    ("m", "cm"): lambda value: value * 100,
    ("cm", "m"): lambda value: value / 100,
    ("km", "mi"): lambda value: value / KM_PER_MILE,
    ("mi", "km"): lambda value: value * KM_PER_MILE,
    ("kg", "lb"): lambda value: value / KG_PER_POUND,
    ("lb", "kg"): lambda value: value * KG_PER_POUND,
    ("l", "gal"): lambda value: value / LITRES_PER_US_GALLON,
    ("gal", "l"): lambda value: value * LITRES_PER_US_GALLON,
    ("c", "f"): lambda value: value * 9 / 5 + 32,
    ("f", "c"): lambda value: (value - 32) * 5 / 9,
}


def convert(value: float, src: str, dst: str) -> float:
    """Convert `value` from unit `src` to unit `dst`."""
    try:
        converter = CONVERTERS[(src, dst)]
    except KeyError:
        raise ValueError(f"unsupported conversion: {src} -> {dst}") from None
    return converter(value)
