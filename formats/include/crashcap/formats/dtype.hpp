#pragma once
// Element types a bundle may hold: a closed allow-list, stable numbering.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace crashcap::formats {

/// Tensor element types. Values match the `DType` enum in bundle.capnp and never change.
enum class DType : uint8_t {
  Float64 = 0,
  Float32 = 1,
  Float16 = 2,
  BFloat16 = 3,
  Int8 = 4,
  Int16 = 5,
  Int32 = 6,
  Int64 = 7,
  UInt8 = 8,
  Bool = 9,
  Complex64 = 10,
  Complex128 = 11,
};

inline constexpr int kDTypeCount = 12;

/// Bytes per element (Bool is one byte, 0 or 1).
size_t elementSize(DType dtype);
/// Lower-case name as numpy/torch spell it: "float32", "bfloat16", "complex64", "bool".
std::string_view dtypeName(DType dtype);
/// Inverse of dtypeName; also accepts torch aliases ("float", "double", "half", "long", "int").
std::optional<DType> parseDType(std::string_view name);
/// The DType with this stable number, or nullopt when the number is outside the allow-list.
std::optional<DType> dtypeFromNumber(unsigned number);
/// True for float16/bfloat16/float32/float64 and the complex types.
bool isFloating(DType dtype);
bool isComplex(DType dtype);

}  // namespace crashcap::formats
