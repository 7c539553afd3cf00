#!/usr/bin/env node
import { reportFailure } from './exit.js';
import { buildProgram } from './program.js';

buildProgram()
  .parseAsync()
  .catch((err: unknown) => process.exit(reportFailure(err)));
