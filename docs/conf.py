"""Sphinx configuration of the onnxgrad_sklearn documentation.

Build with ``python -m sphinx -W --keep-going -b html docs docs/_build/html``
from the project root. Nothing is downloaded during the build. The examples gallery
runs the scripts of ``examples/`` (sphinx-gallery) at every build.
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
    "sphinx_gallery.gen_gallery",
]

source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md", "Thumbs.db", ".DS_Store", "sg_execution_times.rst"]

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

# sphinx-gallery: every script of ../examples runs at every build, even when unchanged
# (run_stale_examples: the package may have changed), and an example that fails fails
# the build; their output and figures go into auto_examples/ (generated, not
# tracked). Names of the package in their code link to the API page.
sphinx_gallery_conf = {
    "examples_dirs": os.fspath(HERE.parent / "examples"),
    "gallery_dirs": "auto_examples",
    "filename_pattern": r"/plot_",
    "within_subsection_order": "FileNameSortKey",
    "run_stale_examples": True,
    "abort_on_example_error": False,
    "download_all_examples": False,
    "remove_config_comments": True,
    "reference_url": {"onnxgrad_sklearn": None},
    "doc_module": ("onnxgrad_sklearn",),
    "backreferences_dir": None,
    "min_reported_time": 1,
    "write_computation_times": False,
    "show_memory": False,
    "matplotlib_animations": False,
}

# pydata-sphinx-theme, as scikit-learn's documentation: the top bar holds the
# pages of the root toctree, the left sidebar the pages below the current one.
html_theme = "pydata_sphinx_theme"
html_title = "onnxgrad_sklearn"
html_short_title = "onnxgrad_sklearn"
html_static_path = ["_static"]
html_theme_options = {
    "logo": {"text": f"onnxgrad_sklearn {release}"},
    "navbar_align": "left",
    "header_links_before_dropdown": 7,
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "secondary_sidebar_items": ["page-toc"],
    "footer_start": ["copyright"],
    "footer_end": ["sphinx-version"],
}
html_sidebars = {
    "index": [],
    "when_to_use": [],
    "performance": [],
    "api": [],
    "getting_started": [],
}
html_show_sourcelink = False
