"""``python -m fleet.launch``: the same as ``fleetrun``."""
from fleet.launch.cli import main

main()
