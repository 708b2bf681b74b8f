"""Sphinx configuration of the onnxgrad_sklearn documentation.

Build with ``python -m sphinx -W --keep-going -b html docs docs/_build/html``
from the project root. Nothing is downloaded during the build.
"""

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, os.fspath(HERE.parent))

import onnxgrad_sklearn  # noqa: E402

project = "onnxgrad_sklearn"
author = "onnxgrad_sklearn contributors"
copyright = "onnxgrad_sklearn contributors"
version = release = onnxgrad_sklearn.__version__

extensions = [
    "sphinx.ext.autodoc",
    "numpydoc",
    "myst_parser",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md", "Thumbs.db", ".DS_Store"]

# docs/performance.md is written separately; it joins the build once a toctree
# of index.md lists it (a page outside every toctree is a warning, an error with -W).
if (HERE / "performance.md").exists() and "performance" not in (HERE / "index.md").read_text(
    encoding="utf-8"
):
    exclude_patterns.append("performance.md")

# autodoc: signatures without type hints (the numpydoc sections give the types),
# members in source order.
autodoc_typehints = "none"
autodoc_member_order = "bysource"

# numpydoc: no member tables (the API page lists the members it documents, so
# nothing is described twice).
numpydoc_show_class_members = False
numpydoc_show_inherited_class_members = False
numpydoc_class_members_toctree = False
numpydoc_attributes_as_param_list = True

# MyST: headings get anchors so pages can link to sections.
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]

html_theme = "alabaster"
html_title = f"onnxgrad_sklearn {release}"
html_theme_options = {
    "description": "Train scikit-learn models on onnxruntime-training",
    "fixed_sidebar": False,
}
html_sidebars = {"**": ["about.html", "navigation.html", "searchbox.html"]}
