import pytest


@pytest.fixture
def items():
    return [
        {"sku": "A1", "name": "Steel Bolt", "qty": 120, "price": 15, "category": "hardware"},
        {"sku": "B2", "name": "Wood Screw", "qty": 8, "price": 10, "category": "hardware"},
        {"sku": "C3", "name": "Paint Brush", "qty": 25, "price": 450, "category": "paint"},
        {"sku": "D4", "name": "Bolt Cutter", "qty": 3, "price": 2999, "category": "tools"},
        {"sku": "E5", "name": "Roller", "qty": 25, "price": 699, "category": "paint"},
    ]
