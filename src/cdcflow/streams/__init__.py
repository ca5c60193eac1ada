"""Streams (EV-1, EV-9, EV-10): definitions, states, the catalog that keeps them, discovery."""
