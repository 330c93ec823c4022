"""Shipping prices for the web shop (EUR)."""

# zone -> (price up to 1 kg, price up to 5 kg, price per kg above 5 kg)
RATES = {
    "domestic": (4.5, 7.0, 1.2),
    "eu": (9.0, 14.0, 2.5),
    "world": (18.0, 32.0, 6.0),
}


def base_cost(weight_kg, up_to_1kg, up_to_5kg, per_extra_kg):
    """The price of one weight tier, before any express surcharge."""
    if weight_kg <= 1:
        return up_to_1kg
    if weight_kg <= 5:
        return up_to_5kg
    return up_to_5kg + (weight_kg - 5) * per_extra_kg


def shipping_cost(weight_kg, zone, express=False):
    if weight_kg <= 0:
        raise ValueError("weight must be positive")
    if zone not in RATES:
        raise ValueError("unknown zone: " + zone)
    cost = base_cost(weight_kg, *RATES[zone])
    if express:
        cost = cost * 1.5 + 2
    return round(cost, 2)
