"""Writes deploy/k8s/prometheusrule.yaml from deploy/prometheus/poirot-alerts.yaml.

The rule file stays the one source of truth (promtool checks and unit-tests it); the
PrometheusRule embeds its `groups:` block verbatim, comments included, because kustomize cannot
wrap a file into a custom resource. `--check` exits 1 when the committed file is stale.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

DEPLOY = Path(__file__).resolve().parent.parent
RULES = DEPLOY / "prometheus" / "poirot-alerts.yaml"
TARGET = DEPLOY / "k8s" / "prometheusrule.yaml"

HEADER = """\
# GENERATED from deploy/prometheus/poirot-alerts.yaml by
# deploy/prometheus/render_prometheusrule.py: edit the rule file, then re-run the script.
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: poirotd
  labels:
    app.kubernetes.io/name: poirotd
    app.kubernetes.io/component: monitoring
    # Many Prometheus Operator installs select rules by a label such as
    # `release: <helm release>`; add it here if yours does (see deploy/README.md).
spec:
"""


def render(rules_text: str) -> str:
    lines = rules_text.splitlines()
    try:
        start = lines.index("groups:")
    except ValueError:
        raise SystemExit(f"{RULES}: no top-level 'groups:' line") from None
    body = [f"  {line}" if line else "" for line in lines[start:]]
    return HEADER + "\n".join(body) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if the target is stale")
    args = parser.parse_args()
    wanted = render(RULES.read_text())
    if args.check:
        if not TARGET.exists() or TARGET.read_text() != wanted:
            print(f"{TARGET} is stale: run {Path(__file__).name}", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(wanted)
    print(f"wrote {TARGET}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
