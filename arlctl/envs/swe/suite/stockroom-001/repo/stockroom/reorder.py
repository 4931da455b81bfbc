"""Which items must be reordered."""


def below_threshold(item):
    return item.quantity < item.reorder_at


def needs_reorder(inventory):
    """SKUs to reorder, sorted."""
    return sorted(item.sku for item in inventory.items() if below_threshold(item))
