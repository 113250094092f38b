"""Python imports this module at start-up when its directory is on ``PYTHONPATH``: with
``DDP_INSTRUMENT=1`` it turns on ``ddp.instrument`` (see ``ddp/instrument/env.py``) before
the script runs. It must never stop the script: a failure prints one line and the script
runs uninstrumented. (Python imports only the first ``sitecustomize`` on the path: this one
shadows any other.)"""

import os
import sys

if os.environ.get("DDP_INSTRUMENT") == "1":
    try:
        from ddp.instrument.activate import install

        install()
    except Exception as e:
        print(f"ddp.instrument: not active ({type(e).__name__}: {e})", file=sys.stderr)
