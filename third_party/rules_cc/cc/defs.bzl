"""A local stand-in for @rules_cc//cc:defs.bzl.

Bazel 4's built-in WORKSPACE suffix wants to download rules_cc, and Debian's
bazel-rules-cc is too new for Bazel 4.2.3. The C++ rules are still native in
Bazel 4, so this file only forwards to them; BUILD files can load it as they
would load the real rules_cc.
"""

def cc_binary(**kwargs):
    native.cc_binary(**kwargs)

def cc_import(**kwargs):
    native.cc_import(**kwargs)

def cc_library(**kwargs):
    native.cc_library(**kwargs)

def cc_proto_library(**kwargs):
    native.cc_proto_library(**kwargs)

def cc_test(**kwargs):
    native.cc_test(**kwargs)

def cc_toolchain(**kwargs):
    native.cc_toolchain(**kwargs)

def cc_toolchain_suite(**kwargs):
    native.cc_toolchain_suite(**kwargs)

def fdo_prefetch_hints(**kwargs):
    native.fdo_prefetch_hints(**kwargs)

def fdo_profile(**kwargs):
    native.fdo_profile(**kwargs)

def objc_import(**kwargs):
    native.objc_import(**kwargs)

def objc_library(**kwargs):
    native.objc_library(**kwargs)
