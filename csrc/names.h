// Python names the recorder reads of every tensor (attributes and methods), made once: building
// a str for each use cost an allocation per attribute read.
#pragma once

#include <pybind11/pybind11.h>

namespace opguard {

struct Names {
  // tensor attributes and methods
  pybind11::str dtype{"dtype"}, shape{"shape"}, layout{"layout"}, device{"device"},
      is_cuda{"is_cuda"}, is_cpu{"is_cpu"}, is_nested{"is_nested"}, version{"_version"};
  pybind11::str stride{"stride"}, data_ptr{"data_ptr"}, get_device{"get_device"},
      is_conj{"is_conj"}, is_neg{"is_neg"}, resolve_conj{"resolve_conj"},
      resolve_neg{"resolve_neg"}, untyped_storage{"untyped_storage"};
  // the autograd node's sequence number; the step state's fields
  pybind11::str sequence_nr{"_sequence_nr"}, step{"step"}, in_optimizer{"in_optimizer"};
};

// One instance per process, made on first use (with the GIL held) and never destroyed: it
// outlives the interpreter.
inline const Names& names() {
  static const Names* const kNames = new Names();
  return *kNames;
}

}  // namespace opguard
