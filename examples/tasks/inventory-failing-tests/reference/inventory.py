"""Warehouse stock levels, keyed by SKU."""


class OutOfStock(Exception):
    pass


class Inventory:
    def __init__(self):
        self._stock = {}

    @staticmethod
    def _key(sku):
        # SKUs are case-insensitive and often arrive with stray spaces.
        return sku.strip().upper()

    def add(self, sku, qty):
        """Add `qty` units (qty >= 1); return the new quantity."""
        if qty < 1:
            raise ValueError("qty must be >= 1")
        key = self._key(sku)
        self._stock[key] = self._stock.get(key, 0) + qty
        return self._stock[key]

    def remove(self, sku, qty):
        """Remove `qty` units; raise OutOfStock when there are fewer. Return the new quantity."""
        key = self._key(sku)
        have = self._stock.get(key, 0)
        if qty > have:
            raise OutOfStock(f"{key}: have {have}, need {qty}")
        left = have - qty
        if left:
            self._stock[key] = left
        else:
            del self._stock[key]
        return left

    def quantity(self, sku):
        return self._stock.get(self._key(sku), 0)

    def skus(self):
        """SKUs that are in stock, sorted."""
        return sorted(self._stock)

    def low_stock(self, threshold):
        """SKUs whose quantity is at or below `threshold`, sorted."""
        return sorted(sku for sku, qty in self._stock.items() if qty <= threshold)
