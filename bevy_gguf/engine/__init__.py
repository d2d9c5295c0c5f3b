"""Requests and the runners that decode them."""
