// Typed plan inputs (plan_layer.h): a struct whose fields are listed once, in an X-macro
// X(type, name, required), and built from Python keywords by that list. A keyword that names no field, a
// value of the wrong type or a required field left out fails when the plan is built, with a message
// naming the struct and the field, never by a lookup that misses at run time.
#pragma once
#include "torch_lite.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace plan_fields {

[[noreturn]] inline void wrong_type(const char* owner, const char* field, const char* expected, py::handle v) {
  throw py::type_error(std::string(owner) + "." + field + ": expected " + expected + ", got " +
                       std::string(py::str(py::type::of(v).attr("__name__"))));
}

// Python value -> the field's type (None: an absent tensor or sub-structure).
template <typename T>
struct From;

template <>
struct From<at::Tensor> {
  static at::Tensor get(py::handle v, const char* owner, const char* field) {
    if (v.is_none()) return at::Tensor();
    try {
      return v.cast<at::Tensor>();
    } catch (const py::cast_error&) {
      wrong_type(owner, field, "a tensor or None", v);
    }
  }
};

template <>
struct From<int64_t> {
  static int64_t get(py::handle v, const char* owner, const char* field) {
    if (!py::isinstance<py::int_>(v) || py::isinstance<py::bool_>(v)) wrong_type(owner, field, "an int", v);
    return v.cast<int64_t>();
  }
};

template <>
struct From<double> {
  static double get(py::handle v, const char* owner, const char* field) {
    if (!(py::isinstance<py::float_>(v) || py::isinstance<py::int_>(v)) || py::isinstance<py::bool_>(v))
      wrong_type(owner, field, "a float", v);
    return v.cast<double>();
  }
};

template <>
struct From<bool> {
  static bool get(py::handle v, const char* owner, const char* field) {
    if (!py::isinstance<py::bool_>(v)) wrong_type(owner, field, "a bool", v);
    return v.cast<bool>();
  }
};

// A bound sub-structure (PlanLinear, PlanMoe): None leaves it as default-constructed (`defined` false).
template <typename S>
struct FromStruct {
  static S get(py::handle v, const char* owner, const char* field) {
    if (v.is_none()) return S();
    if (!py::isinstance<S>(v)) wrong_type(owner, field, S::NAME, v);
    S s = v.cast<S>();
    s.defined = true;
    return s;
  }
};

// S from keywords: each must name a field of S::fields (its X-macro), of its type; every required one given.
template <typename S>
S from_kwargs(const py::kwargs& kwargs) {
  S s;
  std::vector<std::string> given;
  for (auto item : kwargs) {
    const std::string key = py::str(item.first);
    if (!s.set(key, item.second))
      throw py::type_error(std::string(S::NAME) + ": no field " + key + " (its fields: " + S::names() + ")");
    given.push_back(key);
  }
  std::string missing = s.missing(given);
  if (!missing.empty()) throw py::value_error(std::string(S::NAME) + ": missing " + missing);
  return s;
}

}  // namespace plan_fields

// Inside a struct: its fields, `set(name, value)` and `missing(given)` from one X-macro list.
#define LATENTKV_FIELD_DECLARE(type, name, required) type name{};
#define LATENTKV_FIELD_SET(type, name, required) \
  if (key == #name) {                             \
    name = plan_fields::From<type>::get(v, NAME, #name); \
    return true;                                  \
  }
#define LATENTKV_FIELD_MISSING(type, name, required)                                             \
  if (required && std::find(given.begin(), given.end(), std::string(#name)) == given.end()) \
    out += (out.empty() ? "" : ", ") + std::string(#name);
#define LATENTKV_FIELD_NAME(type, name, required) out += (out.empty() ? "" : ", ") + std::string(#name);
#define LATENTKV_FIELDS(LIST)                                              \
  LIST(LATENTKV_FIELD_DECLARE)                                             \
  bool set(const std::string& key, py::handle v) {                         \
    LIST(LATENTKV_FIELD_SET)                                               \
    return false;                                                          \
  }                                                                        \
  std::string missing(const std::vector<std::string>& given) const {      \
    std::string out;                                                       \
    LIST(LATENTKV_FIELD_MISSING)                                           \
    return out;                                                            \
  }                                                                        \
  static std::string names() {                                             \
    std::string out;                                                       \
    LIST(LATENTKV_FIELD_NAME)                                              \
    return out;                                                            \
  }
