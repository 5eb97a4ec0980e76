// crashcap-sample-cls: see samples/train.hpp and --help.
#include "train.hpp"

int main(int argc, char** argv) { return crashcap::samples::sampleMain(crashcap::samples::Task::Cls, argc, argv); }
