"""The cart: items, quantities, and at most one coupon."""


class Cart:
    def __init__(self):
        self.items = {}
        self.coupon = None

    def add(self, name, price, qty=1):
        old_price, old_qty = self.items.get(name, (price, 0))
        self.items[name] = (price, old_qty + qty)

    def apply(self, coupon):
        self.coupon = coupon

    def subtotal(self):
        return round(sum(p * q for p, q in self.items.values()), 2)

    def total(self):
        sub = self.subtotal()
        if self.coupon is not None:
            sub -= self.coupon.discount_on(sub)
        return round(sub, 2)
