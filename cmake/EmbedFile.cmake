# cmake -DINPUT=FILE -DOUTPUT=FILE.cpp -DSYMBOL=name -DNAMESPACE=ns -P EmbedFile.cmake
# Writes a C++ source that defines `const unsigned char SYMBOL[]` (the file's bytes, then a NUL)
# and `const std::size_t SYMBOL_size` in namespace NAMESPACE: a file embedded byte for byte,
# whatever it holds.
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" digits)
math(EXPR bytes "${digits} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "((0x[0-9a-f][0-9a-f],){32})" "\\1\n" body "${body}")
file(WRITE "${OUTPUT}.tmp"
  "// Generated from ${INPUT} by cmake/EmbedFile.cmake: do not edit.\n"
  "#include <cstddef>\n"
  "namespace ${NAMESPACE} {\n"
  "extern const unsigned char ${SYMBOL}[] = {\n${body}0x00};\n"
  "extern const std::size_t ${SYMBOL}_size = ${bytes};\n"
  "}  // namespace ${NAMESPACE}\n")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
