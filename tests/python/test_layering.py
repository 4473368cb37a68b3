"""The C++ tree keeps its layers: dependencies point down only, torch stays
above the runtime, our headers are found only through quoted includes, the
bindings see only the runtime's public headers, and a runtime Storage's state
belongs to the runtime. Pure file scanning: no build, no torch.

Every failure reads `path:line: [rule] what is wrong`. The last tests feed the
checkers fake files that break each rule, so this test provably can fail.
"""

import os
import re
from typing import Dict, FrozenSet, Iterable, List, Optional, Set

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CSRC = os.path.join(ROOT, "csrc")
CXX_SUFFIXES = (".h", ".hpp", ".cc", ".cpp", ".inc")

# Layer (folder under csrc/) -> the layers whose headers it may include.
# pjrt:    the PJRT C ABI and its RAII wrappers; libc and C++ std only.
# ir:      the graph IR and StableHLO printer; C++ std only.
# runtime: storages, transfers, traces, sync, compile cache, options, over pjrt and ir.
# aten:    the PyTorch backend; calls runtime methods, builds ir values. It does not
#          include pjrt/ itself: devices, buffers and plugins are reached through the runtime.
# python:  the extension module torch_pjrt._C; binds every layer (the runtime through
#          its public headers only, see RUNTIME_PUBLIC).
LAYERS: Dict[str, FrozenSet[str]] = {
    "pjrt": frozenset({"pjrt"}),
    "ir": frozenset({"ir"}),
    "runtime": frozenset({"pjrt", "ir", "runtime"}),
    "aten": frozenset({"ir", "runtime", "aten"}),
    "python": frozenset({"pjrt", "ir", "runtime", "aten", "python"}),
}
# The only layers that may see torch, ATen, c10, pybind11 or Python headers.
TORCH_LAYERS = frozenset({"aten", "python"})
TORCH_HEADER = re.compile(r"^(torch|ATen|c10|pybind11)/|^Python\.h$")
# The runtime headers the bindings may include; the rest is the runtime's own business.
# runtime/program.h is the stateless "compile an IR graph through a client"
# API that _C.Client.compile binds; it holds no runtime state.
RUNTIME_PUBLIC = frozenset({
    "runtime/runtime.h", "runtime/metrics.h", "runtime/options.h", "runtime/program.h", "runtime/warnings.h"})
# The header that declares the runtime's Storage, and the class's name.
STORAGE_HEADER = "csrc/runtime/storage.h"
STORAGE_CLASS = "Storage"

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
ACCESS_HACK = re.compile(r"^\s*#\s*define\s+(private|protected|public|class|struct)\b")


def violation(path: str, line: int, rule: str, what: str) -> str:
    return f"{path}:{line}: [{rule}] {what}"


def layer_of(path: str) -> Optional[str]:
    """'csrc/runtime/sync.cc' -> 'runtime'; None outside csrc/<folder>/."""
    parts = path.split("/")
    return parts[1] if len(parts) >= 3 and parts[0] == "csrc" else None


def includes(text: str):
    """(line number, bracket, path) of each #include outside comments."""
    for n, line in enumerate(blank_comments(text).splitlines(), 1):
        m = INCLUDE.match(line)
        if m:
            yield n, m.group(1), m.group(2)


# ------------------------------------------------------------------ includes


def check_includes(path: str, text: str) -> List[str]:
    """Layer, torch-header, bracket and public-runtime rules for one file under csrc/."""
    out = []
    layer = layer_of(path)
    if layer not in LAYERS:
        return [violation(path, 1, "layer-folder",
                          f"csrc/{path.split('/')[1] if layer else ''} is not a layer of the table "
                          f"({', '.join(LAYERS)}): put the file in its layer's folder")]
    for n, bracket, inc in includes(text):
        first = inc.split("/")[0]
        ours = first in LAYERS and "/" in inc
        if TORCH_HEADER.search(inc) and layer not in TORCH_LAYERS:
            out.append(violation(path, n, "no-torch-below-aten",
                                 f"includes {inc}: torch, ATen, c10, pybind11 and Python headers "
                                 f"belong to csrc/aten and csrc/python only, not csrc/{layer}"))
        if bracket == "<" and ours:
            out.append(violation(path, n, "quote-our-headers",
                                 f"includes our header <{inc}> with angle brackets: write \"{inc}\" "
                                 f"(our tree is on the quote-only path, -iquote csrc)"))
        if bracket == '"' and not ours:
            out.append(violation(path, n, "angle-other-headers",
                                 f"includes \"{inc}\" with quotes: it is not a file of ours "
                                 f"(\"<layer>/<file>\" from csrc/); write <{inc}> for torch and system "
                                 f"headers"))
        if not ours:
            continue
        if first not in LAYERS[layer]:
            out.append(violation(path, n, "layers-point-down",
                                 f"csrc/{layer} includes {inc}: csrc/{layer} may use only "
                                 f"{', '.join(sorted(LAYERS[layer]))}"))
        elif layer == "python" and first == "runtime" and inc not in RUNTIME_PUBLIC:
            out.append(violation(path, n, "bindings-use-public-runtime",
                                 f"the bindings include {inc}, a runtime internal: include only "
                                 f"{', '.join(sorted(RUNTIME_PUBLIC))} and call runtime methods"))
    return out


# ------------------------------------------------------------- access hacks


def check_access_hacks(path: str, text: str) -> List[str]:
    """No file outside csrc/runtime redefines access keywords to reach private state."""
    if path.startswith("csrc/runtime/"):
        return []
    return [violation(path, n, "no-access-hacks",
                      f"`{line.strip()}` opens private state to this file: call a Runtime method instead")
            for n, line in enumerate(text.splitlines(), 1) if ACCESS_HACK.match(line)]


# ------------------------------------------------------------------ storage


COMMENT_OR_LITERAL = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)


def blank_comments(text: str, literals: bool = False) -> str:
    """The text with comments (and string/char literals if `literals`) blanked;
    newlines stay, so an offset keeps its line."""
    def blank(m):
        if not literals and m.group(0)[0] in "\"'":
            return m.group(0)
        return re.sub(r"[^\n]", " ", m.group(0))

    return COMMENT_OR_LITERAL.sub(blank, text)


def strip_templates(s: str) -> str:
    prev = None
    while prev != s:
        prev, s = s, re.sub(r"<[^<>]*>", "", s)
    return s


def class_body(code: str, name: str):
    """(offset of the body's first character, body text, "class" or "struct") of
    `class name {...}`, or None."""
    m = re.search(r"\b(class|struct)\s+" + re.escape(name) + r"\b[^;{]*\{", code)
    if not m:
        return None
    start = i = m.end()
    depth = 1
    while i < len(code) and depth:
        depth += {"{": 1, "}": -1}.get(code[i], 0)
        i += 1
    return start, code[start:i - 1], m.group(1)


def members(body: str, default_access: str):
    """(offset in body, access, declaration text) of each member declaration at the top level of a class body."""
    access, stmt, stmt_start, i = default_access, "", 0, 0
    while i < len(body):
        c = body[i]
        if c == "{":
            depth, j = 1, i + 1
            while j < len(body) and depth:
                depth += {"{": 1, "}": -1}.get(body[j], 0)
                j += 1
            head = stmt.strip()
            if "(" in strip_templates(head) or re.match(r"(class|struct|union|enum)\b", head):
                # A function body or a nested type: the declaration ends here.
                yield stmt_start, access, head
                stmt, i = "", j
                while i < len(body) and body[i] in " \t\n;":
                    i += 1
                stmt_start = i
                continue
            stmt += " {} "  # a brace initializer of a data member
            i = j
            continue
        if c == ";":
            if stmt.strip():
                yield stmt_start, access, stmt.strip()
            stmt, stmt_start = "", i + 1
        else:
            if not stmt.strip():
                stmt_start = i
            stmt += c
            label = re.fullmatch(r"\s*(public|private|protected)\s*:", stmt)
            if label:
                access, stmt = label.group(1), ""
        i += 1


def is_data_member(decl: str) -> bool:
    if re.match(r"(friend|using|typedef|template|static_assert|class|struct|union|enum)\b", decl):
        return False
    if re.search(r"\boperator\b", decl):
        return False  # operator=, operator(), ...
    if re.search(r"\b(constexpr|static\s+const)\b", decl):
        return False  # a class constant, not a storage's state
    head = strip_templates(re.split(r"=|\{", decl)[0])
    return "(" not in head and bool(re.search(r"\w\s*(\[[^\]]*\])?\s*$", head))


def check_storage_header(path: str, text: str, runtime_classes: Iterable[str]) -> List[str]:
    """Storage declares no data member outside `private:` and befriends runtime classes only."""
    code = blank_comments(text, literals=True)
    found = class_body(code, STORAGE_CLASS)
    if found is None:
        return [violation(path, 1, "storage-owned-by-runtime", f"declares no class {STORAGE_CLASS}")]
    start, body, keyword = found
    allowed = set(runtime_classes) - {STORAGE_CLASS}
    out = []
    for offset, access, decl in members(body, "private" if keyword == "class" else "public"):
        line = code.count("\n", 0, start + offset) + 1
        if decl.startswith("friend"):
            m = re.fullmatch(r"friend\s+(?:class\s+|struct\s+)?((?:tpj::)?(?:runtime::)?)(\w+)", decl)
            if not m or m.group(2) not in allowed:
                out.append(violation(path, line, "storage-owned-by-runtime",
                                     f"`{decl}`: {STORAGE_CLASS}'s only friends are runtime classes "
                                     f"({', '.join(sorted(allowed)) or 'none found'})"))
        elif access != "private" and is_data_member(decl):
            out.append(violation(path, line, "storage-owned-by-runtime",
                                 f"`{decl}` is a {access} data member of {STORAGE_CLASS}: its state is "
                                 f"private (a trailing-underscore member after `private:`), read through "
                                 f"accessors and changed by Runtime methods"))
    return out


def runtime_classes(headers: Dict[str, str]) -> Set[str]:
    """Names of the classes and structs that csrc/runtime's headers define."""
    names = set()
    for text in headers.values():
        code = blank_comments(text, literals=True)
        names.update(re.findall(r"\b(?:class|struct)\s+(\w+)\s*(?:final\s*)?(?::[^;{]*)?\{", code))
    return names


# -------------------------------------------------------------------- cmake

# csrc as a root of its own (not torch's include/torch/csrc/api/include).
ROOT_VAR = r"(\$\{(CMAKE_SOURCE_DIR|PROJECT_SOURCE_DIR|CMAKE_CURRENT_SOURCE_DIR|CMAKE_CURRENT_LIST_DIR)\}/)?"
OUR_TREE = r"(^|[\s\"])" + ROOT_VAR + r"csrc\b"


def check_cmake(path: str, text: str, root: bool) -> List[str]:
    """Our tree reaches the compiler as -iquote only: never an include directory (-I)."""
    code = re.sub(r"#[^\n]*", lambda m: " " * len(m.group(0)), text)
    out = []
    for m in re.finditer(r"\b(target_include_directories|include_directories)\s*\(", code):
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"(": 1, ")": -1}.get(code[j], 0)
            j += 1
        if re.search(OUR_TREE, code[m.end():j - 1]):
            out.append(violation(path, code.count("\n", 0, m.start()) + 1, "iquote-only",
                                 f"{m.group(1)}(... csrc ...) puts our tree on the <...> path, where a file "
                                 f"of ours could shadow a torch header: pass -iquote csrc instead"))
    if root and not re.search(r"-iquote\s*\"?" + ROOT_VAR + r"csrc\b", code):
        out.append(violation(path, 1, "iquote-only", "passes no `-iquote .../csrc`: our headers must be on the "
                                                       "quote-only include path"))
    return out


# -------------------------------------------------------------- the tree


def read(rel: str) -> str:
    with open(os.path.join(ROOT, rel), encoding="utf-8", errors="replace") as f:
        return f.read()


def tree_files(top: str) -> List[str]:
    out = []
    for d, _, names in os.walk(os.path.join(ROOT, top)):
        out += [os.path.relpath(os.path.join(d, n), ROOT).replace(os.sep, "/")
                for n in names if n.endswith(CXX_SUFFIXES)]
    return sorted(out)


def report(found: List[str]) -> str:
    return f"{len(found)} layering violation(s):\n  " + "\n  ".join(found)


def test_the_tree_has_the_layer_folders():
    missing = [f"csrc/{layer}" for layer in LAYERS if not os.path.isdir(os.path.join(CSRC, layer))]
    assert not missing, f"layer folders missing: {missing}"


def test_includes_follow_the_layer_table():
    found = []
    for rel in tree_files("csrc"):
        found += check_includes(rel, read(rel))
    assert not found, report(found)


def test_storage_state_belongs_to_the_runtime():
    assert os.path.isfile(os.path.join(ROOT, STORAGE_HEADER)), (
        f"{STORAGE_HEADER}:1: [storage-owned-by-runtime] missing: the runtime declares {STORAGE_CLASS} there")
    headers = {rel: read(rel) for rel in tree_files("csrc/runtime") if rel.endswith(".h")}
    found = check_storage_header(STORAGE_HEADER, headers[STORAGE_HEADER], runtime_classes(headers))
    assert not found, report(found)


def test_no_file_outside_the_runtime_redefines_access():
    found = []
    for rel in tree_files("csrc") + tree_files("tests/cpp"):
        found += check_access_hacks(rel, read(rel))
    assert not found, report(found)


def test_cmake_puts_our_tree_on_the_quote_path_only():
    found = check_cmake("CMakeLists.txt", read("CMakeLists.txt"), root=True)
    for d, dirs, names in os.walk(ROOT):
        rel_dir = os.path.relpath(d, ROOT)
        if rel_dir == ".":
            dirs[:] = [x for x in dirs if not x.startswith((".", "build"))]  # venv, git, build trees
        elif "CMakeLists.txt" in names:
            rel = os.path.join(rel_dir, "CMakeLists.txt").replace(os.sep, "/")
            found += check_cmake(rel, read(rel), root=False)
    assert not found, report(found)


# ------------------------------------------------- the checkers can fail

GOOD_STORAGE = """
class Storage {
 public:
  Storage(int device, size_t nbytes) : device_(device), nbytes_(nbytes) {}
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  int device() const { return device_; }  // int public_looking_;
  std::optional<ir::DType> dtype() const { return dtype_; }
  static constexpr int kAlign = 64;
  using Callback = std::function<void(int)>;

 private:
  friend class Runtime;
  const int device_;
  std::map<int, std::vector<int>> index_{};
  bool pending_ = false;
};
"""


@pytest.mark.parametrize("path,text,rule,line", [
    ("csrc/ir/graph.h", '#pragma once\n#include "runtime/runtime.h"\n', "layers-point-down", 2),
    ("csrc/runtime/sync.cc", '#include "aten/tensor.h"\n', "layers-point-down", 1),
    ("csrc/ir/graph.h", '// a /* in a line comment\n#include "runtime/runtime.h"\n', "layers-point-down", 2),
    ("csrc/pjrt/client.cc", '#include "ir/graph.h"\n', "layers-point-down", 1),
    ("csrc/aten/device.cc", '#include "pjrt/client.h"\n', "layers-point-down", 1),
    ("csrc/aten/device.cc", '#include "python/bind.h"\n', "layers-point-down", 1),
    ("csrc/runtime/runtime.h", "\n\n#include <ATen/ATen.h>\n", "no-torch-below-aten", 3),
    ("csrc/ir/op.cc", "#include <torch/library.h>\n", "no-torch-below-aten", 1),
    ("csrc/pjrt/error.h", "#include <c10/util/Exception.h>\n", "no-torch-below-aten", 1),
    ("csrc/runtime/trace.cc", "#include <pybind11/pybind11.h>\n", "no-torch-below-aten", 1),
    ("csrc/runtime/trace.cc", "#include <Python.h>\n", "no-torch-below-aten", 1),
    ("csrc/aten/tensor.cc", "#include <runtime/runtime.h>\n", "quote-our-headers", 1),
    ("csrc/aten/tensor.cc", '#include "ATen/ATen.h"\n', "angle-other-headers", 1),
    ("csrc/pjrt/plugin.cc", '#include "dlfcn.h"\n', "angle-other-headers", 1),
    ("csrc/pjrt/plugin.cc", '#include "c_api.h"\n', "angle-other-headers", 1),
    ("csrc/python/bind_torch.cc", '#include "runtime/storage.h"\n', "bindings-use-public-runtime", 1),
    ("csrc/python/bind_torch.cc", '#include "runtime/dtype_map.h"\n', "bindings-use-public-runtime", 1),
    ("csrc/torch/tensor.cc", '#include "runtime/runtime.h"\n', "layer-folder", 1),
])
def test_include_checker_reports_each_rule(path, text, rule, line):
    found = check_includes(path, text)
    assert any(v.startswith(f"{path}:{line}: [{rule}]") for v in found), found


def test_include_checker_passes_a_clean_file_and_ignores_comments():
    text = ('#include "python/bind.h"\n#include <ATen/ATen.h>\n#include <vector>\n#include "runtime/runtime.h"\n'
            '#include "aten/tensor.h"\n#include "pjrt/client.h"\n'
            '// #include "runtime/storage.h"\n/* #include <runtime/x.h>\n#include "runtime/sync.h" */\n')
    assert check_includes("csrc/python/bind_torch.cc", text) == []
    assert check_includes("csrc/runtime/sync.cc", '#include "runtime/storage.h"\n#include <mutex>\n') == []


@pytest.mark.parametrize("path,text,line", [
    ("csrc/aten/tensor.cc", "#include <vector>\n#define private public\n#include \"runtime/storage.h\"\n", 2),
    ("csrc/python/bind_torch.cc", "#  define class struct\n", 1),
    ("tests/cpp/runtime_test.cc", "#define protected public\n", 1),
])
def test_access_hack_checker_reports(path, text, line):
    found = check_access_hacks(path, text)
    assert any(v.startswith(f"{path}:{line}: [no-access-hacks]") for v in found), found


def test_access_hack_checker_allows_the_runtime_and_ordinary_macros():
    assert check_access_hacks("csrc/runtime/sync.cc", "#define private public\n") == []
    assert check_access_hacks("csrc/aten/ops.cc", "#define TPJ_CLASS_NAME 1\n#define privates 2\n") == []


def test_storage_checker_passes_private_state():
    assert check_storage_header(STORAGE_HEADER, GOOD_STORAGE, {"Runtime", "Storage"}) == []


@pytest.mark.parametrize("edit,line", [
    (lambda s: s.replace(" public:\n", " public:\n  size_t nbytes_;\n"), 4),
    (lambda s: s.replace("  bool pending_ = false;\n", " public:\n  bool pending_ = false;\n"), 18),
    (lambda s: s.replace("  const int device_;\n", " protected:\n  const int device_{0};\n"), 16),
    (lambda s: s.replace("friend class Runtime;", "friend class TensorImpl;"), 14),
    (lambda s: s.replace("friend class Runtime;", "friend void Poke(Storage&);"), 14),
    (lambda s: s.replace("class Storage {", "struct Storage {\n  int device_;"), 3),
])
def test_storage_checker_reports(edit, line):
    found = check_storage_header(STORAGE_HEADER, edit(GOOD_STORAGE), {"Runtime", "Storage"})
    assert any(v.startswith(f"{STORAGE_HEADER}:{line}: [storage-owned-by-runtime]") for v in found), found


def test_storage_checker_reports_a_missing_class():
    assert check_storage_header(STORAGE_HEADER, "class Runtime {};\n", {"Runtime"})


def test_cmake_checker():
    good = 'function(tpj_own_headers t)\n  target_compile_options(${t} PUBLIC "-iquote${CMAKE_SOURCE_DIR}/csrc")\n' \
           'endfunction()\ntarget_include_directories(x SYSTEM PUBLIC ${TPJ_TORCH_INCLUDE})  # not csrc\n'
    assert check_cmake("CMakeLists.txt", good, root=True) == []
    bad = good + "add_library(y a.cc)\ntarget_include_directories(y PUBLIC\n  ${CMAKE_SOURCE_DIR}/csrc)\n"
    assert any(v.startswith("CMakeLists.txt:6: [iquote-only]") for v in check_cmake("CMakeLists.txt", bad, True))
    assert any("[iquote-only]" in v for v in check_cmake("CMakeLists.txt", "include_directories(csrc)\n", True))
    assert any("passes no `-iquote" in v for v in check_cmake("CMakeLists.txt", "project(x)\n", root=True))
