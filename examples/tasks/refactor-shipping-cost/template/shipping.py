"""Shipping prices for the web shop (EUR)."""


def shipping_cost(weight_kg, zone, express=False):
    if weight_kg <= 0:
        raise ValueError("weight must be positive")
    if zone == "domestic":
        if weight_kg <= 1:
            cost = 4.5
        elif weight_kg <= 5:
            cost = 7.0
        else:
            cost = 7.0 + (weight_kg - 5) * 1.2
        if express:
            cost = cost * 1.5 + 2
    elif zone == "eu":
        if weight_kg <= 1:
            cost = 9.0
        elif weight_kg <= 5:
            cost = 14.0
        else:
            cost = 14.0 + (weight_kg - 5) * 2.5
        if express:
            cost = cost * 1.5 + 2
    elif zone == "world":
        if weight_kg <= 1:
            cost = 18.0
        elif weight_kg <= 5:
            cost = 32.0
        else:
            cost = 32.0 + (weight_kg - 5) * 6.0
        if express:
            cost = cost * 1.5 + 2
    else:
        raise ValueError("unknown zone: " + zone)
    return round(cost, 2)
