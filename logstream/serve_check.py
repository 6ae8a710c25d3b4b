"""`logstream serve --config FILE --check`: what serve needs at start, checked without Kafka.

The settings' shape is checked when they load (`settings.load_settings`); this checks what
they point at, the commonest mistakes: the model directory (or the store's live version,
and the shadow version) loads as serve loads it, weights and tokenizer included, and the
routes file parses (without its secrets, which a laptop or CI does not have: `${ENV}` and
`file:` references are checked for form). No broker is contacted. Every problem is named
with its field, all in one line.
"""

from __future__ import annotations

from pathlib import Path

from logstream.alerts.config import load_config
from logstream.engine.model import load_model_dir
from logstream.errors import UserError
from logstream.lifecycle import model_store
from logstream.settings import ServeSettings, SettingsError


def check(settings: ServeSettings, source: Path | str | None) -> str:
    """One line saying what was checked; SettingsError naming every problem found."""
    problems, checked = [], []
    model = settings.model
    field = "model.store" if model.store is not None else "model.dir"
    try:
        checked.append(f"model {_load(settings)}")
    except UserError as exc:
        problems.append(f"{field}: {exc}")
    routes = settings.sink.routes
    if settings.sink.kind == "alerts" and routes is not None:
        try:
            load_config(routes, secrets=False)
            checked.append(f"routes {routes}")
        except UserError as exc:
            problems.append(f"sink.routes: {exc}")
    if problems:
        raise SettingsError(f"{source}: " + "; ".join(problems))
    return f"config ok: {source} ({', '.join(checked)}; Kafka not contacted)"


def _load(settings: ServeSettings) -> str:
    """Load the model serve would load (and the shadow version); what it is, in words."""
    model = settings.model
    if model.store is None:
        assert model.dir is not None  # ModelSettings: exactly one of dir and store
        load_model_dir(model.dir)
        return str(model.dir)
    if not model.store.is_dir():
        raise model_store.StoreError(
            f"{model.store} does not exist; add a version: logstream models add MODEL --store {model.store}"
        )
    directory = model_store.live_dir(model.store)
    load_model_dir(directory)
    if model.shadow is not None:
        load_model_dir(model_store.version_dir(model.store, model.shadow))
    return f"store {model.store}, live version {directory.name}"
