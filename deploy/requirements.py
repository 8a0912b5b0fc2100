"""Print the image's Python requirements, one a line: pyproject.toml's dependencies, its
kv-tier extra, and the build backend (the image installs the project itself with
--no-build-isolation, so the backend must be installed beside the dependencies). The
Dockerfile and scripts/wheelhouse.sh read the same list, before the source is copied."""

import sys
import tomllib
from pathlib import Path

path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent.parent / "pyproject.toml"
pyproject = tomllib.loads(path.read_text())
project = pyproject["project"]
for line in [
    *project["dependencies"],
    *project["optional-dependencies"]["kv-tier"],
    *pyproject["build-system"]["requires"],
    "wheel",
]:
    print(line)
