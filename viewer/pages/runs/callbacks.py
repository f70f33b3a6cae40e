"""The Runs page is static per request (the app layout rescans the roots); nothing to register."""


def register(app, catalog) -> None:
    return None
