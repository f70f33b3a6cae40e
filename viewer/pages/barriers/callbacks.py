"""The Barriers page has no interactive controls; its layout is computed per request."""


def register(app, catalog) -> None:
    return None
