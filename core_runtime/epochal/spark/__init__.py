"""Adapters from the SDK contracts to PySpark's Python data source API."""
