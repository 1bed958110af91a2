"""The folder ``allocsim capture`` adds to the end of ``PYTHONPATH`` for the processes a captured script starts (``sitecustomize``)."""
