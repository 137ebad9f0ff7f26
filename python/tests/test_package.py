# SPDX-License-Identifier: Apache-2.0
"""The installed package: version from version.h, the library it loaded.

DLSYNC_EXPECT_BUNDLED=1 (CI, gpu-check.sh after installing the wheel) also
asserts that the libdlsync.so inside the package was the one loaded, and that
the package did not come from the source tree."""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # source tree fallback
import dlsync  # noqa: E402


class PackageTest(unittest.TestCase):
    def test_version_is_the_library_version(self):
        self.assertRegex(dlsync.__version__, r"^\d+\.\d+\.\d+$")
        self.assertEqual(dlsync.__version__, dlsync.version())

    def test_library_path_names_a_file(self):
        self.assertTrue(os.path.isfile(dlsync.library_path()) or "/" not in dlsync.library_path())

    @unittest.skipUnless(os.environ.get("DLSYNC_EXPECT_BUNDLED") == "1", "not an installed-package run")
    def test_bundled_library_loaded(self):
        pkg = os.path.dirname(os.path.abspath(dlsync.__file__))
        self.assertNotIn("DLSYNC_LIBRARY", os.environ)
        self.assertEqual(os.path.dirname(os.path.abspath(dlsync.library_path())), pkg)
        self.assertFalse(os.path.isfile(os.path.join(pkg, "..", "..", "include", "dlsync", "version.h")))
        # not python/dlsync of a source tree (python/tests is its sibling there)
        self.assertFalse(os.path.isfile(os.path.join(pkg, "..", "tests", "test_binding.py")), pkg)
        self.assertTrue(re.match(r"^\d", dlsync.__version__))


if __name__ == "__main__":
    unittest.main()
