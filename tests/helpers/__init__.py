"""Helpers shared by test modules across tests/unit, tests/integration and tests/e2e.

Imported as ``tests.helpers.<module>`` (the repository root is on ``pythonpath`` in
pyproject), like ``tests.unit._routing_helpers``. Plain functions and classes, no fixtures:
each test module keeps its own small fixtures and builds them from these.
"""
