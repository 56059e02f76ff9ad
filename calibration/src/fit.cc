// Placeholder: being written (fit.h).
#include "moeplan/calibration/fit.h"
