"""The project's real architectures exported with the dynamo exporter, artifacts from ORT's
generate_artifacts and ours, trained 3 steps by ORT and by ort_torch_compat against a float64
referee, classified as the architecture sweep does (docs/architecture-sweep.md, "The project's
real architectures, dynamo-exported").

    python scripts/real_arch_dynamo.py --out docs/real-arch-dynamo.json          # 13 recipes, dyn18 and dyn17
    python scripts/real_arch_dynamo.py --recipes lstm,vit --exporters dyn18 --out r.json
    python scripts/real_arch_dynamo.py --table docs/real-arch-dynamo.json

The code is ``ort_torch_compat.testing.real_arch_dynamo``.
"""

import sys

from ort_torch_compat.testing.real_arch_dynamo import main

if __name__ == "__main__":
    sys.exit(main())
