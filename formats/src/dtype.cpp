#include "crashcap/formats/dtype.hpp"

#include <array>

namespace crashcap::formats {
namespace {
struct DTypeRow {
  DType dtype;
  std::string_view name;
  size_t size;
};
constexpr std::array<DTypeRow, kDTypeCount> kRows = {{
    {DType::Float64, "float64", 8},   {DType::Float32, "float32", 4},  {DType::Float16, "float16", 2},
    {DType::BFloat16, "bfloat16", 2}, {DType::Int8, "int8", 1},        {DType::Int16, "int16", 2},
    {DType::Int32, "int32", 4},       {DType::Int64, "int64", 8},      {DType::UInt8, "uint8", 1},
    {DType::Bool, "bool", 1},         {DType::Complex64, "complex64", 8}, {DType::Complex128, "complex128", 16},
}};
}  // namespace

size_t elementSize(DType dtype) {
  auto i = static_cast<size_t>(dtype);
  return i < kRows.size() ? kRows[i].size : 0;
}

std::string_view dtypeName(DType dtype) {
  auto i = static_cast<size_t>(dtype);
  return i < kRows.size() ? kRows[i].name : std::string_view("invalid");
}

std::optional<DType> parseDType(std::string_view name) {
  for (const auto& row : kRows)
    if (row.name == name) return row.dtype;
  if (name == "float" ) return DType::Float32;
  if (name == "double") return DType::Float64;
  if (name == "half") return DType::Float16;
  if (name == "long") return DType::Int64;
  if (name == "int") return DType::Int32;
  if (name == "short") return DType::Int16;
  if (name == "cfloat") return DType::Complex64;
  if (name == "cdouble") return DType::Complex128;
  return std::nullopt;
}

std::optional<DType> dtypeFromNumber(unsigned number) {
  if (number >= kRows.size()) return std::nullopt;
  return static_cast<DType>(number);
}

bool isFloating(DType dtype) {
  switch (dtype) {
    case DType::Float64: case DType::Float32: case DType::Float16: case DType::BFloat16:
    case DType::Complex64: case DType::Complex128:
      return true;
    default:
      return false;
  }
}

bool isComplex(DType dtype) { return dtype == DType::Complex64 || dtype == DType::Complex128; }

}  // namespace crashcap::formats
