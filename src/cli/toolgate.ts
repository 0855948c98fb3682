import { runToolgate } from './toolgate/run.js';

process.exitCode = await runToolgate(process.argv);
