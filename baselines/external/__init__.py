"""Problems from outside the project: a KernelBench-format Python file (`file.py`, named `file:<sha256>`; run as
a module and checked by `file_module.py`) or a problem folder (`folder.py`, named `folder:<sha256>`); a file's
operator core for the static rules (`reference_ops.py`); the ModelNew candidate form and the export marker
(`model_new.py`)."""
