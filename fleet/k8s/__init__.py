"""Kubernetes manifests for a fleet job: ``python -m fleet.k8s ... -- python train.py``.

- `JobSpec` / `build_manifests`: the objects of a job (headless Service, Indexed Jobs or a
  StatefulSet, or seed-style pods with the permission to list pods), as dicts.
- `secret_from_keys_dir`: the Secret holding a CURVE key directory.
- ``python -m fleet.k8s.rank``: the command of seed-style pods (rank by IP, then run the
  script with Paddle's role variables).

docs/kubernetes.md is the manual.
"""
from fleet.k8s.manifests import JobSpec, build_manifests, secret_from_keys_dir

__all__ = ["JobSpec", "build_manifests", "secret_from_keys_dir"]
