"""Call a Dash callback through the app's real HTTP endpoint (Flask test client, no browser)."""
from __future__ import annotations

import json


def _spec(item):
    cid, prop = item
    return {"id": str(cid), "property": prop}


def call(app, outputs, inputs, state=(), changed=None):
    """outputs: [(id, prop)]; inputs/state: [(id, prop, value)]; returns {id: {prop: value}} or
    raises AssertionError with the server's answer when the callback failed."""
    r = post(app, outputs, inputs, state, changed)
    if r.status_code == 204:
        return None
    assert r.status_code == 200, r.get_data(as_text=True)[:2000]
    return json.loads(r.get_data(as_text=True))["response"]


def text_of(component) -> str:
    """All strings inside a serialised Dash component tree."""
    out = []

    def walk(x):
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, (int, float)) and not isinstance(x, bool):
            out.append(str(x))
        elif isinstance(x, list):
            for y in x:
                walk(y)
        elif isinstance(x, dict):
            if "props" in x:
                walk(x["props"].get("children"))
            else:
                for v in x.values():
                    walk(v)
    walk(component)
    return " ".join(out)


def post(app, outputs, inputs, state=(), changed=None):
    """Like call, but returns the raw response: for tests of what a server must refuse."""
    key = next(k for k in app.callback_map
               if all(f"{o[0]}.{o[1]}" in k for o in outputs) and k.count(".") >= len(outputs))
    payload = {
        "output": key,
        "outputs": [_spec(o) for o in outputs] if key.startswith("..") else _spec(outputs[0]),
        "inputs": [{"id": str(i), "property": p, "value": v} for i, p, v in inputs],
        "state": [{"id": str(i), "property": p, "value": v} for i, p, v in state],
        "changedPropIds": changed if changed is not None else [f"{inputs[0][0]}.{inputs[0][1]}"],
    }
    return app.server.test_client().post("/_dash-update-component", json=payload)


def runs_grid(app, request=None) -> dict:
    """The Runs grid's answer (getRowsResponse) to a rows request (default: every row, as listed)."""
    from viewer.pages.runs.ids import Ids
    r = call(app, [(Ids.TABLE, "getRowsResponse"), (Ids.MESSAGE, "children")],
             [(Ids.TABLE, "getRowsRequest", request or {"startRow": 0, "endRow": 1000})])
    return r[Ids.TABLE]["getRowsResponse"]


def runs_text(app) -> str:
    """Every row of the Runs grid as text (what a person reads in its cells)."""
    return " ".join(str(v) for r in runs_grid(app)["rowData"] for v in r.values())
