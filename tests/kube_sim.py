"""What Kubernetes would give a container of fleet.k8s's manifests, without a cluster.

``container_environment`` resolves a container's ``env`` as the kubelet does: downward-API
``fieldRef`` values from a dict standing for the pod, and ``$(NAME)`` references to
variables defined earlier in the list (``$$`` escapes a ``$``).
"""
import re

_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def container_environment(container, fields):
    """The variables of ``container`` (a manifest dict) in a pod described by ``fields``.

    Args:
        container: one entry of a pod template's ``containers``.
        fields: {fieldPath: value} for the pod, e.g. {"status.podIP": "10.0.0.4",
            "metadata.name": "ctr-server-0"}.

    Returns:
        dict: name -> value, in definition order.

    Raises:
        KeyError: a fieldRef the pod does not have (a typo in the manifest).
    """
    env = {}
    for item in container.get("env", ()):
        if "valueFrom" in item:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            def expand(match):
                if match.group(0) == "$$":
                    return "$"
                return env.get(match.group(1), match.group(0))
            env[item["name"]] = _REFERENCE.sub(expand, item.get("value", ""))
    return env
