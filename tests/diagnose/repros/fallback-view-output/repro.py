"""plait reproducer: the Stax backend diverges on a 2-node graph

Run it with plait installed: ``python repro.py``. It exits 1 while the divergence reproduces and
0 once it is gone; ``plait diagnose fallback-view-output`` does the same.
"""

import sys
from pathlib import Path

from plait.diagnose import rerun

result = rerun(Path(__file__).resolve().parent)
print(result)
sys.exit(1 if result.reproduced else 0)
