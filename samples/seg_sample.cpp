// crashcap-sample-seg: see samples/train.hpp and --help.
#include "train.hpp"

int main(int argc, char** argv) { return crashcap::samples::sampleMain(crashcap::samples::Task::Seg, argc, argv); }
