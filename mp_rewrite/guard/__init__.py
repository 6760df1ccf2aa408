"""The accuracy guard: screen, attribution, search, result and its SavedModel entry point.

`mp_rewrite.guard(...)` is the public function (mp_rewrite.guard.accuracy_guard.guard). Once this subpackage is
imported, Python binds the name `mp_rewrite.guard` to the subpackage, so the subpackage is callable too and calls
that function: `mp_rewrite.guard(graph_def, fetches, feeds)` works whatever was imported before.
"""

import sys
import types


class _CallableGuardPackage(types.ModuleType):
    def __call__(self, *args, **kwargs):
        from .accuracy_guard import guard
        return guard(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableGuardPackage
