"""Start the capture child in the user's interpreter with the user's ``sys.path`` only: ``python bootstrap.py -- SCRIPT ARGS``.

``allocsim capture`` runs this file by its path, with the environment the user has (their
``PYTHONPATH`` untouched): putting allocsim's package root on ``PYTHONPATH`` instead would make the
user's interpreter load whatever else sits there first (in a regular install, site-packages: allocsim's
numpy, pandas, torch; in an editable one, the repository's ``validate`` package). Python puts this
file's folder first on ``sys.path``; it is taken off at once, before anything is imported, and the
capture's modules are loaded from allocsim's folder by path under the private name
``_allocsim_capture`` (so a user package named ``allocsim`` is not shadowed either). Only the
standard library is imported before the child's ``main``.
"""

import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_PACKAGE = os.path.dirname(_HERE)            # allocsim/
if sys.path and sys.path[0] and os.path.realpath(sys.path[0]) == os.path.realpath(_HERE):
    del sys.path[0]

_spec = importlib.util.spec_from_file_location("_allocsim_capture", os.path.join(_PACKAGE, "__init__.py"),
                                               submodule_search_locations=[_PACKAGE])
_module = importlib.util.module_from_spec(_spec)
sys.modules["_allocsim_capture"] = _module
_spec.loader.exec_module(_module)

from _allocsim_capture.torch_capture import child  # noqa: E402

if __name__ == "__main__":
    child.run(sys.argv[1:])
