/** The words of the replay benchmarks' prompts and answers. */
export const WORDS = [
  'alpha',
  'river',
  'stone',
  'quietly',
  'beneath',
  'the',
  'silver',
  'moon',
  'a',
  'traveler',
  'counts',
  'seven',
  'lanterns',
  'and',
  'sings',
  'of',
  'harbors',
  'far',
  'away.',
];

/** `n` of the words, in a fixed order that `shift` starts elsewhere. */
export const wordText = (n: number, shift: number) => Array.from({ length: n }, (_, i) => WORDS[(i * 7 + shift) % WORDS.length]).join(' ');
