"""One start-up audit cache for the training runs of a test module that neither audits nor patches the op table.

The suite turns the audit cache off (tests/conftest.py), because a test that patches the op table in its own
process would be handed a report whose key cannot see the patch. The modules that use :func:`shared_audit_cache`
(through tests/conftest.py's ``audit_once_per_model``, or the GPU proof's CPU run in tests/test_gpu_proof.py)
patch no op table and assert nothing about the audit: their runs (in the test process and in the processes they
start, which inherit the variable) take the report from a folder private to this test process, computed by the
first run of each key and read by the next, as a user's second run reads it. The audit then costs a run about a
second less; what a run computes does not change (tests/test_audit_cache.py trains a computed and a cached run to
the same weights).
"""

import contextlib
import os
import shutil
import tempfile

from utils.determinism.audit_cache import CACHE_ENV


@contextlib.contextmanager
def shared_audit_cache():
    """``FFCA_AUDIT_CACHE`` set to a fresh temporary folder while the block runs; the folder is removed after."""
    folder, before = tempfile.mkdtemp(prefix="ffca-test-audit-"), os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = folder
    try:
        yield folder
    finally:
        if before is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = before
        shutil.rmtree(folder, ignore_errors=True)
