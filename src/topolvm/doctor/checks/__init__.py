"""The checks, one module each: a module here that defines ``CHECK`` is a check (adding a check
is adding a file). They run in ``CHECK.order``; the seed's case comes first."""

from __future__ import annotations

import importlib
import pkgutil

from topolvm.doctor.model import Check


def all_checks() -> list[Check]:
    found = []
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        check = getattr(module, "CHECK", None)
        if isinstance(check, Check):
            found.append(check)
    return sorted(found, key=lambda c: (c.order, c.id))
