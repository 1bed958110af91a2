"""The folder ``allocsim capture`` puts first on the ``PYTHONPATH`` of the processes a captured script starts (``sitecustomize``)."""
